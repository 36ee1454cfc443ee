mkdir -p r/s
touch r/f r/s/g
find r -type d | sort
find r -type f | sort
