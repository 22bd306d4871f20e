"""moegate: a CPU-first inference gateway for giant Mixture-of-Experts checkpoints."""
