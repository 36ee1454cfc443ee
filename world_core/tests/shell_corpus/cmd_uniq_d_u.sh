printf 'a\na\nb\nc\nc\n' | uniq -d
printf 'a\na\nb\nc\nc\n' | uniq -u
