"""Integrations of moekit's ops into model libraries (transformers)."""
