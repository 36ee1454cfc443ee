printf 'a 1\nb 2\nc 3\n' | awk '{print $2, $1}'
