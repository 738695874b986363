"""Quality gates: MinHash decontamination and dedup, and versioned task sets."""
