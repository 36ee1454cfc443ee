mkdir -p k/l
touch k/1 k/l/2
find k | sort
