"""Tables and figures made from stored run results."""
