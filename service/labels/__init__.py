"""AI labels (CONTRACT §10): the visible `AI生成`, the TC260 metadata, C2PA."""
