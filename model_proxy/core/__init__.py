"""Protocol-independent types of the model proxy."""
