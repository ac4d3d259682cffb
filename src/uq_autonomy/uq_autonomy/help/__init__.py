"""Asking a person for help (ROS-free): when to ask (:mod:`.policy`), the crop a person sees
(:mod:`.crops`), and teaching an answered object again while its track stays wrong
(:mod:`.follow_up`)."""
