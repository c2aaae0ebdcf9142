"""The studies: documents built on the grid-report core (timbench.report) over committed results: the seed paper
(paper*), the field's claims (claims*), early warnings, proxy fidelity and the mismatch risk map (risk*)."""
