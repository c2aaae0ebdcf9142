"""The condition vocabulary: spec keys and their parser, noise kinds, fault names, accumulation orders."""
