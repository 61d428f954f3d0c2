"""My account: a copy of my data (the export), the end of my account (deletion)."""
