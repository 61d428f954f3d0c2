"""Buying credits: payment providers, orders, webhooks and the reconciler."""
