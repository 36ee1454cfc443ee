echo 'a a a' | sed 's/a/b/g'
