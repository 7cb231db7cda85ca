"""r3rag demo."""
