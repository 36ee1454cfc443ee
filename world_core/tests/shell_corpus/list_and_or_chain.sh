false && echo a || echo b
true && echo c || echo d
