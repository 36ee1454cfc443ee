printf 'abc\nxyz\n' | sed 'y/abc/ABC/'
printf 'one\ntwo\n' | sed '1a\
inserted'
