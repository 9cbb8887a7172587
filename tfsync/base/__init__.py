"""Base helpers: they import no other part of tfsync."""
