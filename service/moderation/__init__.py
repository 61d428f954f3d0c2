"""Content safety: the prompt check, the moderation log, reports and sanctions."""
