echo 'john smith' | sed -E 's/([a-z]+) ([a-z]+)/\2, \1/'
