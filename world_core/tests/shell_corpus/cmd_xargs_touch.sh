printf 'f1\nf2\n' | xargs touch
ls
