"""What a build must show before anything is written: numerical checks with their tolerances
(`checks.require`), the composition certificate (`certify`), and zero-shot accuracy on
labelled folders (`evaluate`)."""
