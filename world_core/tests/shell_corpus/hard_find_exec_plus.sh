mkdir -p a
touch a/1 a/2 a/3
find a -type f -exec echo {} + | tr ' ' '\n' | sort
