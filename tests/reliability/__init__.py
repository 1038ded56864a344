"""The reliability campaign: crashes, contention, full disk, corrupt files,
hostile input and a privacy audit (see docs/RELIABILITY.md)."""
