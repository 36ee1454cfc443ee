printf 'b\na\nb\na\n' | sort -u
