"""The ground floor: the vocabulary every other package speaks (the case and model shapes,
the byte model, the GPU description, the result record and its store). Nothing here
imports from foscar/, baselines/, suite/ or reports/."""
