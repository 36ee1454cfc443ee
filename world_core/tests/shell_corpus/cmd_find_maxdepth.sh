mkdir -p m/n/o
touch m/a m/n/b m/n/o/c
find m -maxdepth 2 -type f | sort
