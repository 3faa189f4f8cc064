"""The SessionService's storage, one module per concern (see docs/architecture.md)."""
