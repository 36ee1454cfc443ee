printf 'a b c\nd e\n' | awk '{print NR, NF}'
