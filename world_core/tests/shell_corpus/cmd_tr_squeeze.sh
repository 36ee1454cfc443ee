echo 'aaabbbccc   d' | tr -s 'a-c '
