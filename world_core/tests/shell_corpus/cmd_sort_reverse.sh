printf 'a\nc\nb\n' | sort -r
