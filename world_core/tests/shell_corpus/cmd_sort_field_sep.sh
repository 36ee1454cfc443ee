printf 'a:3\nb:1\nc:2\n' | sort -t: -k2,2n
