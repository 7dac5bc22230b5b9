"""One module per command: `run` (kbd run and kbd sweep), `history` (kbd results and kbd sweeps),
`doctor` and `replay`. `kbd compare`, `kbd levels` and `kbd daemon` live with their features."""
