"""What the model proxy's metrics cost per call (``python -m bench.proxy_metrics``)."""
