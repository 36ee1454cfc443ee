printf 'a\nb\nc\nd\n' | sed -n '2,3p'
