"""The detector on simulator data: training, evaluation, GP variants on its features and
procedural unknown objects."""
