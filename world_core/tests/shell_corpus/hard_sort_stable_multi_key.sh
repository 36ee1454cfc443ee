printf 'b 2\na 2\nc 1\na 1\n' | sort -k2,2n -k1,1
