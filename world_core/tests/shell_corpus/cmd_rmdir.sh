mkdir empty
rmdir empty
[ -e empty ] || echo removed
