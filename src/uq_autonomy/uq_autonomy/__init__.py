"""Shared autonomy from perception uncertainty: arbitration and ask-for-help."""
