"""Cloud moderation services behind one interface: text and images in, a verdict out."""
