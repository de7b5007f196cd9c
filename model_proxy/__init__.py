"""The model API proxy: provider protocols in, token IDs to the backend, completion records captured."""
