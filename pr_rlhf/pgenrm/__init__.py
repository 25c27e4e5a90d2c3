"""P-GenRM training: teacher chains (PSI), and the data each training stage consumes."""
