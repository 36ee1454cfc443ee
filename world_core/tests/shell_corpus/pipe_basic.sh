printf 'c\nb\na\n' | sort
