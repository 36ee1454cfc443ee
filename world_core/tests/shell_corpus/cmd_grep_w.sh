printf 'foo\nfoobar\nbar foo\n' | grep -w foo
