"""Helpers of the image-classification client script (data iterators, the fit loop)."""
