"""What several harness packages share (envs/common/config.py); it names no harness."""
