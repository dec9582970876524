"""The database seam: each backend's connections, pools and bulk copy."""
