printf 'a\na\nb\n' | uniq -c
