"""Figure generators: each module has make(outdir) -> [paths]; `minipar figures` runs them all."""
