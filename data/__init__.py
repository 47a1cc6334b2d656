"""Chunked zarr stores for genomes and time series, datasets and Lightning data modules."""
