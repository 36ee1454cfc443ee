printf 'cat\ndog\ncow\n' > f
grep -E '^(cat|cow)$' f
