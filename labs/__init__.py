"""Teaching labs: one folder per lab (`NN-slug/`) with a README, starter code, the solution and a
checker, plus the machinery behind `fabriclab labs` and `fabriclab lab check N [DIR]`."""
