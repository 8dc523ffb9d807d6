"""One module per `rlfleet` sub-command; each has register(subparsers). `args` holds what they share."""
