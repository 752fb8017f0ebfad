package wirecache

import "testing"

// TestHitTurns: every turnEvery-th unit of work wakes each helper that waits, and none before; a helper that
// does not wait is skipped, and one removed is woken no more.
func TestHitTurns(t *testing.T) {
	var nilTurns *hitTurns
	nilTurns.worked() // gives none, and does not panic

	var turns hitTurns
	a, b := make(chan struct{}, 1), make(chan struct{}, 1) // a wake each, as a waiting helper takes it
	turns.add(a)
	turns.add(b)
	for range turnEvery - 1 {
		turns.worked()
	}
	if len(a)+len(b) != 0 {
		t.Fatalf("woken after %d units of work, want after %d", turnEvery-1, turnEvery)
	}
	turns.worked()
	if len(a) != 1 || len(b) != 1 {
		t.Fatalf("after %d units of work: %d and %d wake-ups, want one each", turnEvery, len(a), len(b))
	}
	// a is busy with its turn: a second one finds it so and does not wait for it.
	for range turnEvery {
		turns.worked()
	}
	<-a
	<-b
	turns.remove(b)
	for range turnEvery {
		turns.worked()
	}
	if len(a) != 1 {
		t.Fatal("a helper waiting was not woken for its next turn")
	}
	if len(b) != 0 {
		t.Fatal("a helper removed was woken")
	}
}
