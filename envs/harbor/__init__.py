"""Harbor backend (issue 6): Harbor task directories and Harbor's verifier reward files.

Not registered as a harness yet; `reward.py` and `task_dir.py` are the pure pieces the Harbor
harness will build on. Harbor itself is the optional extra `harbor` (pinned 0.25.0).
"""
