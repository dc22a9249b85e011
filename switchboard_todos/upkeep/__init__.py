"""Keeping the table healthy while todos come and go: the reaper that takes expired leases back
(`reaper`), retention that deletes finished todos (`retention`), and what holds back vacuum and
swells the claim's indexes (`vacuum`, `reindex`)."""
