"""GB10 MoE backend: the NVFP4 MoE backend policy (`policy`), its start-up self-check
(`selfcheck`), tuned Triton fused-MoE configs (`tuned_configs`, `tune`)."""
