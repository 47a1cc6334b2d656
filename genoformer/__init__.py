"""genoformer: transformers on very long scientific sequences."""
